"""How the chaos run reaches its groups: openly, or with every door locked (`--secure`):
CurveZMQ keys on the client and replica endpoints and an API key on the gateway
(docs/security.md), so that the faults are survived with authentication on as well."""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from scripts.group import keygen


@dataclass(frozen=True)
class Access:
    keys: Path | None = None      # scripts/serve keygen's directory; None: no CURVE
    api_key: str | None = None    # the gateway's one key; None: no key

    @classmethod
    def locked(cls, tmp: Path) -> Access:
        keys = tmp / "keys"
        if keygen.main([str(keys), "--replicas", "1"]) != 0:
            raise RuntimeError(f"scripts/serve keygen {keys} failed")
        key = secrets.token_urlsafe(24)
        (tmp / "api-keys").write_text(key + "\n")
        return cls(keys, key)

    def serve_args(self) -> list[str]:
        """The main group's flags: the key file is read by serve, never put on argv."""
        curve = ["--curve", str(self.keys)] if self.keys else []
        keys = ["--api-key-file", str(self.keys.parent / "api-keys")] if self.api_key else []
        return curve + keys

    def join_args(self) -> list[str]:
        return ["--curve", str(self.keys)] if self.keys else []

    def client(self) -> dict:
        """A listed client's keys (requests)."""
        return self._pair("clients/client0.key_secret")

    def operator(self) -> dict:
        """The server's own pair: stats() is the operator's call under CURVE."""
        return self._pair("server.key_secret")

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _pair(self, secret: str) -> dict:
        if self.keys is None:
            return {}
        return {"server_key": str(self.keys / "server.key"),
                "client_key": str(self.keys / secret)}
