"""ApiError: an answer in OpenAI's error format, raised anywhere in the gateway and turned
into a response by app.py's middleware."""
from __future__ import annotations

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
               405: "invalid_request_error", 408: "invalid_request_error",
               413: "invalid_request_error",
               429: "rate_limit_error", 503: "service_unavailable_error"}


class ApiError(Exception):
    """{"error": {message, type, param, code}}; `param` names the field at fault; `code`
    is the status unless OpenAI names the error (a 401's "invalid_api_key")."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message,
                          "type": ERROR_TYPES.get(self.status, "server_error"),
                          "param": self.param,
                          "code": self.status if self.code is None else self.code}}
