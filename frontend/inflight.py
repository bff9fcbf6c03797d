"""The frontend's index of unfinished requests: by fid, by (client, request_id), by client."""
from __future__ import annotations

from typing import Iterator

from frontend.request import RequestState


class Inflight:
    def __init__(self):
        self._by_fid: dict[int, RequestState] = {}
        self._by_key: dict[tuple[bytes, str], RequestState] = {}
        self._by_ident: dict[bytes, dict[int, RequestState]] = {}

    def __len__(self) -> int:
        return len(self._by_fid)

    def __iter__(self) -> Iterator[RequestState]:
        return iter(list(self._by_fid.values()))

    def add(self, st: RequestState) -> None:
        self._by_fid[st.fid] = st
        self._by_key[st.key] = st
        self._by_ident.setdefault(st.ident, {})[st.fid] = st

    def remove(self, st: RequestState) -> None:
        self._by_fid.pop(st.fid, None)
        self._by_key.pop(st.key, None)
        mine = self._by_ident.get(st.ident)
        if mine is not None:
            mine.pop(st.fid, None)
            if not mine:
                del self._by_ident[st.ident]

    def by_fid(self, fid: int) -> RequestState | None:
        return self._by_fid.get(fid)

    def by_key(self, ident: bytes, request_id: str) -> RequestState | None:
        return self._by_key.get((ident, request_id))

    def count_of(self, ident: bytes) -> int:
        return len(self._by_ident.get(ident, ()))

    def of_client(self, ident: bytes) -> list[RequestState]:
        return list(self._by_ident.get(ident, {}).values())

    def clients(self) -> list[bytes]:
        return list(self._by_ident)
