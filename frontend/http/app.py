"""The gateway's aiohttp application: OpenAI's routes (the Responses API's in
responses_api.py), vLLM's /tokenize, /detokenize, /version, /v1/score and /v1/rerank (scores.py),
/health and /metrics.

Every handler reaches the engine through the one AsyncClient in `Gateway`; every error
leaves in OpenAI's format ({"error": {message, type, param, code}}).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from functools import cached_property

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from core.ipc.lifeline import pid_alive
from frontend.client.common import ClientError
from frontend.compile_check import CompileCheck
from frontend.http.pool import ClientPool
from frontend.http.auth import GUARD, Guard, require_key
from frontend.http import cors
from frontend.http.chat import ChatTemplate
from frontend.http.chat_render import render_chat
from frontend.http.embeddings import embeddings
from frontend.http.errors import ApiError
from frontend.http.format import CompletionFormat
from frontend.http.generate import RETRY_AFTER_S, generate
from frontend.http.identity import identity
from frontend.http.offload import Offload
from frontend.http.jsonbody import BODY, parse_json
from frontend.http.metrics import Metrics
from frontend.http import responses_api
from frontend.http.models import ServedModel
from frontend.http.responses_store import ResponsesStore
from frontend.http import scores
from frontend.http.schema import PRIORITY_HEADER, parse_chat, parse_completion, parse_priority
from frontend.http.tokens import Tokens, detokenize, tokenize, tokenizer_info
from frontend.http.tool_replies import chat_format
from frontend.http.version import package_version

log = logging.getLogger("http")

HEALTH_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 1 << 20  # aiohttp answers a larger body with 413
BODY_TIMEOUT_S = 10.0     # a body still incomplete after this gets 408 and the connection closes
CLIENT_GONE = 499         # nginx's code for "the client went away first"


RENDERS_QUEUED = 4096   # chat renders waiting or running: more than requests can be in flight


@dataclass
class Gateway:
    """What the handlers share: one per app, never module-global."""
    client: object           # a ClientPool (or one client-like stand-in in tests)
    model: str               # the name /v1/models lists and replies carry
    max_model_len: int
    chat: ChatTemplate
    metrics: Metrics
    created: int
    body_timeout: float = BODY_TIMEOUT_S
    compiles: CompileCheck = field(default_factory=CompileCheck)   # the tools' schemas
    responses: ResponsesStore = field(default_factory=ResponsesStore)   # /v1/responses' store
    strict_model: bool = False   # --served-model-name: requests must name `model` (models.py)
    hidden_size: int = 0         # an embedding's length (the only `dimensions` accepted)

    @cached_property
    def served(self) -> ServedModel:
        return ServedModel(self.model, self.created, self.max_model_len, self.strict_model)

    def client_for(self, request: web.Request):
        """What carries this user's requests, counted under the cap (see ClientPool)."""
        pool = self.client
        return pool.member(identity(request)) if isinstance(pool, ClientPool) else pool

    @cached_property
    def tokens(self) -> Tokens | None:
        """The served tokenizer (None in tests that run without one)."""
        return None if self.chat is None else Tokens(self.chat.tokenizer)

    @cached_property
    def renders(self) -> Offload:
        """Where chat prompts are rendered: off the event loop, each bounded in time
        (render_bound.py); as many waiting as requests may be in flight."""
        return Offload(per_user=RENDERS_QUEUED, queued=RENDERS_QUEUED)

    @cached_property
    def offload(self) -> Offload:
        """Where /tokenize and /detokenize run: off the event loop (see Offload)."""
        return Offload()


GATEWAY = web.AppKey("gateway", Gateway)


def make_app(gw: Gateway, guard: Guard | None = None,
             origins: frozenset[str] = frozenset()) -> web.Application:
    """`guard`: the API keys every route but the open ones needs (auth.py); None: none.
    `origins`: the browser origins CORS allows (cors.py); none by default."""
    app = web.Application(middlewares=[count_status, cors.preflight, openai_errors,
                                       require_key],
                          client_max_size=MAX_BODY_BYTES)
    app[GATEWAY] = gw
    cors.install(app, origins)
    if guard is not None:
        app[GUARD] = guard
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/embeddings", embeddings_route)
    app.router.add_post("/v1/score", score_route)
    app.router.add_post("/v1/rerank", rerank_route)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", retrieve_response)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model_id:.+}", model)   # a Hub id holds a slash
    app.router.add_get("/version", version)
    app.router.add_post("/tokenize", tokenize_route)
    app.router.add_post("/detokenize", detokenize_route)
    app.router.add_get("/tokenizer_info", tokenizer_info_route)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


# ------------------------------------------------------------------ middlewares


@web.middleware
async def count_status(request: web.Request, handler):
    resource = request.match_info.route.resource
    path = resource.canonical if resource is not None else "other"
    code = 500
    try:
        resp = await handler(request)
        code = resp.status
        return resp
    except web.HTTPException as e:
        code = e.status
        raise
    except asyncio.CancelledError:
        # aiohttp cancels the handler of a client that disconnects, and at shutdown's end
        code = CLIENT_GONE
        log.info("%s %s cancelled: the client disconnected or the gateway is stopping",
                 request.method, request.path)
        raise
    finally:
        request.app[GATEWAY].metrics.observe_http(path, code)


@web.middleware
async def openai_errors(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e)
    except ConnectionError as e:
        # The client left mid-body or mid-stream: nobody to answer, nothing to trace.
        # aiohttp's write of this reply fails quietly on the closing transport.
        log.info("%s %s: the client disconnected (%s)", request.method, request.path, e)
        return web.Response(status=CLIENT_GONE)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error_response(ApiError(e.status, e.reason, BODY if e.status == 400 else None))
    except Exception:
        log.exception("unexpected error on %s", request.path)
        return error_response(ApiError(500, "internal error in the gateway"))


def error_response(e: ApiError) -> web.Response:
    headers = ({"Retry-After": str(RETRY_AFTER_S)} if e.status == 429
               else {"WWW-Authenticate": "Bearer"} if e.status == 401 else None)
    resp = web.json_response(e.body(), status=e.status, headers=headers)
    if e.status == 408:  # the rest of the body may never come: do not wait for another request
        resp.force_close()
    return resp


# ------------------------------------------------------------------ handlers


async def _body(request: web.Request) -> tuple[dict, int | None]:
    """The JSON body and the X-TL-Priority header (None when absent)."""
    priority = parse_priority(request.headers.get(PRIORITY_HEADER))
    timeout = request.app[GATEWAY].body_timeout
    try:
        async with asyncio.timeout(timeout):   # not wait_for: see AsyncClient._next
            raw = await request.read()
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s") from None
    body = parse_json(raw)
    request.app[GATEWAY].served.check(body)
    return body, priority


async def completions(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    body, priority = await _body(request)
    gen = parse_completion(body, priority, gw.max_model_len)
    return await generate(request, gw.client_for(request), gen,
                          CompletionFormat(gw.model, gen, gw.tokens), gw.metrics)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    body, priority = await _body(request)
    gen = await render_chat(gw, identity(request), body, priority)
    return await generate(request, gw.client_for(request), gen,
                          chat_format(gw.model, gen, gw.tokens, gw.chat), gw.metrics)


async def embeddings_route(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    body, priority = await _body(request)
    return await embeddings(request, gw.client_for(request), body, priority, gw.model,
                            gw.hidden_size)


async def score_route(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    body, priority = await _body(request)
    return await scores.score(request, gw.client_for(request), body, priority, gw.model)


async def rerank_route(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    body, priority = await _body(request)
    return await scores.rerank(request, gw.client_for(request), body, priority, gw.model)


async def create_response(request: web.Request) -> web.StreamResponse:
    body, priority = await _body(request)
    return await responses_api.create(request, request.app[GATEWAY], body, priority)


async def retrieve_response(request: web.Request) -> web.Response:
    return responses_api.retrieve(request, request.app[GATEWAY])


async def tokenize_route(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    body, _ = await _body(request)
    return web.json_response(await gw.offload.run(
        identity(request), tokenize, gw.tokens, body, gw.chat, gw.max_model_len))


async def detokenize_route(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    body, _ = await _body(request)
    return web.json_response(await gw.offload.run(identity(request), detokenize, gw.tokens,
                                                  body))


async def tokenizer_info_route(request: web.Request) -> web.Response:
    chat = request.app[GATEWAY].chat
    return web.json_response(tokenizer_info(chat.tokenizer, chat.template))


async def models(request: web.Request) -> web.Response:
    return web.json_response(request.app[GATEWAY].served.listing())


async def model(request: web.Request) -> web.Response:
    return web.json_response(request.app[GATEWAY].served.card_of(request.match_info["model_id"]))


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": package_version()})


async def health(request: web.Request) -> web.Response:
    stats = await _stats(request.app[GATEWAY])
    if stats is None:
        raise ApiError(503, "the engine does not answer stats()")
    replicas = [replica_health(r) for r in stats.get("replicas") or [stats]]
    if not any(r["ok"] for r in replicas):
        dead = sorted({name for r in replicas for name in r["dead"]})
        raise ApiError(503, f"engine process(es) not running: {', '.join(dead)}")
    status = "ok" if all(r["ok"] for r in replicas) else "degraded"
    return web.json_response({"status": status, "replicas": replicas})


def replica_health(st: dict) -> dict:
    """One replica: its processes on this machine alive (a joined replica's pids are on
    another machine: that it answered stats is its health)."""
    pids = {} if st.get("joined") else st.get("pids", {})
    dead = sorted(name for name, pid in pids.items() if not pid_alive(pid))
    return {"replica": st.get("replica", 0), "joined": bool(st.get("joined")), "ok": not dead,
            "dead": dead, "running": st.get("running"), "waiting": st.get("waiting")}


async def metrics(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    gw.metrics.refresh(await _stats(gw))
    # aiohttp's content_type argument refuses parameters such as version=: a raw header
    return web.Response(body=gw.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _stats(gw: Gateway) -> dict | None:
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT_S):   # not wait_for: see AsyncClient._next
            return await gw.client.stats()
    except (TimeoutError, ClientError):
        return None
