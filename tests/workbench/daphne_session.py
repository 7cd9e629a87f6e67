"""Signed-in browser sessions on a real Daphne, made over HTTP as a browser makes them (the sign-up or
login form with its CSRF token), for tests that open the session-authenticated sockets (the chat's, the
dashboard's) without a browser. Standard library only: urllib with a cookie jar."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.parse
import urllib.request

PASSWORD = "a-long-pass-9!"


class Session:
    """One browser's cookies on the Daphne at `address`."""

    def __init__(self, address: str) -> None:
        self.username = ""  # set by sign_up or log_in
        self.base = f"http://{address}"
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def _form(self, path: str, fields: dict[str, str], action: str | None = None) -> str:
        """POST a form of the page at `path` (to `action`, default the page itself) with its CSRF token;
        the URL the answer ended at."""
        return self._post(path, fields, action).geturl()

    def _post(self, path: str, fields: dict[str, str], action: str | None = None):
        page = self.opener.open(self.base + path, timeout=30).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token, f"{path} has no CSRF token"
        body = urllib.parse.urlencode({"csrfmiddlewaretoken": token.group(1), **fields}).encode()
        return self.opener.open(self.base + (action or path), body, timeout=30)

    def new_token(self, name: str) -> tuple[int, str]:
        """A new API token made on the tokens page: (its id, the plaintext shown once)."""
        page = self._post("/tokens", {"name": name}).read().decode()
        plaintext = re.search(r'id="new-token">([^<]+)<', page)
        ids = [int(i) for i in re.findall(r'/tokens/(\d+)/revoke', page)]
        assert plaintext and ids, "the tokens page shows the new token and its revoke button"
        return max(ids), plaintext.group(1)

    def revoke_token(self, token_id: int) -> None:
        """The Revoke button of the tokens page."""
        self._form("/tokens", {}, action=f"/tokens/{token_id}/revoke")

    def sign_up(self, username: str) -> Session:
        """Signs up (open sign-up sends its maker to the login page, which answers a taken name alike:
        workbench/accounts/signup.py), then logs in."""
        landed = self._form("/signup", {"username": username, "password1": PASSWORD, "password2": PASSWORD})
        assert landed.startswith(self.base + "/login?"), f"sign-up of {username!r} ended at {landed}"
        return self.log_in(username, PASSWORD)

    def log_in(self, username: str, password: str) -> Session:
        self.username = username
        landed = self._form("/login", {"username": username, "password": password})
        assert landed == self.base + "/", f"login of {username!r} ended at {landed}"
        return self

    def log_out(self) -> None:
        """The Log out button every page has."""
        landed = self._form("/", {}, action="/logout")
        assert landed.startswith(self.base + "/login"), f"logout ended at {landed}"

    def new_conversation(self) -> int:
        """A new conversation of this user's (the page's New button), its id."""
        landed = self._form("/", {})
        found = re.fullmatch(re.escape(self.base) + r"/c/(\d+)", landed)
        assert found, landed
        return int(found.group(1))

    def cookie(self) -> str:
        """The Cookie header a socket's handshake sends."""
        return "; ".join(f"{c.name}={c.value}" for c in self.jar)

    def socket_headers(self) -> dict[str, str]:
        """A browser's handshake headers: the cookie, and the Origin of the page (browsers always send one)."""
        return {"Cookie": self.cookie(), "Origin": self.base}
