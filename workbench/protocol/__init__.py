"""What the chat, API and dashboard sockets share: the JSON socket base, JSON input checks, the
generation request's validated input and the model choice of a frame."""
