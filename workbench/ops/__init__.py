"""The operator's side: runtime flag changes per worker and their audit log."""
