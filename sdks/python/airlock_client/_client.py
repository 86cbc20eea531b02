"""The run-centric facade over the generated client (``airlock_client.generated``).

Every call goes through the generated operation of the route it names; a
failure is raised as :class:`AirlockError` with the API's ``{"error": {"code",
"message"}}`` and the status. No call ever returns a connection's secret: the
API has no route that answers it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
from httpx_sse import EventSource, SSEError

from .generated import AuthenticatedClient
from .generated.api.agents import register_agent
from .generated.api.artifacts import list_run_artifacts
from .generated.api.connections import create_connection, get_connection, put_connection
from .generated.api.runs import (
    cancel_run,
    create_run,
    get_run,
    get_run_audit,
    get_run_result,
    list_run_egress,
    stream_run_events,
)
from .generated.models import (
    Agent,
    Artifact,
    Connection,
    EgressRecord,
    Error,
    GetRunAuditFormat,
    NewConnection,
    NewConnectionFields,
    NewConnectionType,
    NewRun,
    NewRunFiles,
    RegisterAgent,
    RegisterAgentFiles,
    RotateConnection,
    RotateConnectionFields,
    Run,
    RunLimits,
)
from .generated.types import UNSET, Response

#: An agent directory's manifest, as `airlock run -f` reads it.
MANIFEST = "airlock.toml"


class AirlockError(Exception):
    """The API refused a call: its HTTP status and its ``error`` body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class StreamEvent:
    """One event of a run's stream.

    ``event`` is its kind (``log``, ``result``, …; ``end`` last). ``id`` is its
    store id (``None`` for ``end``). ``data`` is the decoded JSON: an ``Event``
    object, or for ``end`` the run as it ended.
    """

    event: str
    id: int | None
    data: Any


#: The HTTP status each of the API's error codes is answered with: what an
#: error that arrives inside a stream (an SSE ``error`` event, on a stream
#: answered 200) is raised with.
STATUS_OF_CODE: dict[str, int] = {
    "bad_request": 400,
    "unauthorized": 401,
    "quota_exceeded": 403,
    "signature_invalid": 403,
    "signature_expired": 403,
    "not_found": 404,
    "conflict": 409,
    "too_large": 413,
    "unsupported_media_type": 415,
    "invalid": 422,
    "rate_limited": 429,
    "queue_full": 429,
    "internal": 500,
    "unavailable": 503,
    "storage_full": 507,
}


def _parsed(resp: Response[Any]) -> Any:
    """The answer of a generated call, or its error raised."""
    if isinstance(resp.parsed, Error):
        e = resp.parsed.error
        raise AirlockError(int(resp.status_code), e.code, e.message)
    if resp.parsed is None:
        raise _error_of(int(resp.status_code), resp.content)
    return resp.parsed


def _error_of(status: int, body: bytes) -> AirlockError:
    try:
        e = json.loads(body)["error"]
        return AirlockError(status, str(e["code"]), str(e["message"]))
    except (ValueError, KeyError, TypeError):
        return AirlockError(status, "unexpected", body[:200].decode("utf-8", "replace"))


def _agent_files(root: Path) -> dict[str, str]:
    """The agent directory's files as the server takes them (as the CLI's
    ``--server`` sends them): regular UTF-8 files, hidden ones and symbolic
    links skipped, the manifest apart."""
    files: dict[str, str] = {}

    def walk(d: Path) -> None:
        for p in sorted(d.iterdir()):
            if p.name.startswith(".") or p.is_symlink():
                continue
            if p.is_dir():
                walk(p)
            elif p.is_file() and p != root / MANIFEST:
                rel = p.relative_to(root).as_posix()
                try:
                    files[rel] = p.read_text(encoding="utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(
                        f"{p}: the server takes UTF-8 text files only"
                    ) from e

    walk(root)
    return files


def _texts(files: Mapping[str, str | bytes | Path]) -> dict[str, str]:
    """Input files as the API takes them: UTF-8 text."""
    out: dict[str, str] = {}
    for rel, v in files.items():
        if isinstance(v, Path):
            v = v.read_bytes()
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{rel}: the server takes UTF-8 text files only"
                ) from e
        out[rel] = v
    return out


class Agents:
    def __init__(self, api: AuthenticatedClient) -> None:
        self._api = api

    def register(self, directory: str | Path) -> Agent:
        """Registers the agent of a directory (its ``airlock.toml`` and its
        files), under the name its manifest gives; registering again replaces it."""
        root = Path(directory)
        manifest = (root / MANIFEST).read_text(encoding="utf-8")
        body = RegisterAgent(
            manifest=manifest, files=RegisterAgentFiles.from_dict(_agent_files(root))
        )
        return _parsed(register_agent.sync_detailed(client=self._api, body=body))


class Runs:
    def __init__(self, api: AuthenticatedClient, reconnects: int) -> None:
        self._api = api
        self._reconnects = reconnects

    def create(
        self,
        agent: str,
        prompt: str | None = None,
        *,
        limits: dict[str, Any] | None = None,
        files: Mapping[str, str | bytes | Path] | None = None,
    ) -> Run:
        """Queues a run of a registered agent (``limits``: ``memory_mb``,
        ``cpus``, ``timeout_seconds``). ``files``: input files, relative path
        in the agent's workspace → UTF-8 text (``str``, ``bytes`` or a local
        ``Path`` to read), placed there before the agent starts."""
        body = NewRun(
            agent=agent,
            prompt=UNSET if prompt is None else prompt,
            limits=UNSET if limits is None else RunLimits.from_dict(limits),
            files=UNSET if not files else NewRunFiles.from_dict(_texts(files)),
        )
        return _parsed(create_run.sync_detailed(client=self._api, body=body))

    def get(self, run_id: str) -> Run:
        return _parsed(get_run.sync_detailed(run_id, client=self._api))

    def stream(
        self, run_id: str, last_event_id: int | None = None
    ) -> Iterator[StreamEvent]:
        """The run's events as they come (every event but heartbeats), ending
        with ``end``, which carries the run as it ended.

        A dropped connection, a replica that shuts down (``error`` with code
        ``unavailable``) or a ``503`` is reconnected with ``Last-Event-ID``: no
        event is lost or repeated. Up to ``reconnects`` attempts in a row that bring
        nothing new are made, 0.2 s apart and doubling, before the error is raised.
        """
        last = last_event_id
        failures = 0
        while True:
            progressed = False
            try:
                for ev in self._stream_once(run_id, last):
                    progressed = True
                    if ev.id is not None:
                        last = ev.id
                    yield ev
                    if ev.event == "end":
                        return
                cause: Exception = ConnectionError("the stream closed before its end")
            except _Unavailable as e:
                cause = e.error
            except (httpx.TransportError, SSEError) as e:
                cause = e
            except AirlockError as e:
                # A replica that is starting, or a store that does not answer,
                # passes; any other refusal is final.
                if e.status != 503:
                    raise
                cause = e
            failures = 0 if progressed else failures + 1
            if failures > self._reconnects:
                raise cause
            time.sleep(0.2 * 2 ** max(failures - 1, 0))

    def _stream_once(self, run_id: str, after: int | None) -> Iterator[StreamEvent]:
        # The generated operation's request (its path), asked for as a stream.
        req = stream_run_events._get_kwargs(run_id)
        headers = {"Accept": "text/event-stream"}
        if after is not None:
            headers["Last-Event-ID"] = str(after)
        client = self._api.get_httpx_client()
        with client.stream(req["method"], req["url"], headers=headers) as resp:
            if resp.status_code != 200:
                raise _error_of(resp.status_code, resp.read())
            for sse in EventSource(resp).iter_sse():
                data = json.loads(sse.data) if sse.data else None
                if sse.event == "error":
                    err = _error_of(200, sse.data.encode())
                    err = AirlockError(
                        STATUS_OF_CODE.get(err.code, 500), err.code, err.message
                    )
                    if err.code == "unavailable":
                        raise _Unavailable(err)
                    raise err
                # The `end` event has no id of its own (an SSE parser keeps
                # the last one it saw): only an event of the run carries one.
                ev_id = None if sse.event == "end" or not sse.id else int(sse.id)
                yield StreamEvent(event=sse.event, id=ev_id, data=data)

    def wait(self, run_id: str) -> Run:
        """Follows the run's stream to its end; the run as it ended."""
        for ev in self.stream(run_id):
            if ev.event == "end":
                return Run.from_dict(ev.data)
        raise AssertionError("stream() returns only after its end")

    def result(self, run_id: str) -> Any:
        """The result the run reported last (JSON); 404 if it reported none."""
        resp = get_run_result.sync_detailed(run_id, client=self._api)
        if resp.status_code != 200:
            raise _error_of(int(resp.status_code), resp.content)
        return json.loads(resp.content)

    def egress(self, run_id: str, limit: int | None = None) -> list[EgressRecord]:
        """Every request that left the run's sandbox, and its refusals."""
        log = _parsed(
            list_run_egress.sync_detailed(
                run_id, client=self._api, limit=UNSET if limit is None else limit
            )
        )
        return list(log.egress)

    def audit(self, run_id: str, format: str | None = None) -> Iterator[dict[str, Any]]:
        """Every decision made for the run (``AuditRecord``s, docs/audit.md),
        oldest first, read line by line as the server streams them; with
        ``format="ocsf"`` the network decisions as OCSF events."""
        # The generated operation's request (its path and query), read as a stream.
        req = get_run_audit._get_kwargs(
            run_id, format_=UNSET if format is None else GetRunAuditFormat(format)
        )
        client = self._api.get_httpx_client()
        with client.stream(req["method"], req["url"], params=req.get("params")) as resp:
            if resp.status_code != 200:
                raise _error_of(resp.status_code, resp.read())
            for line in resp.iter_lines():
                if line:
                    yield json.loads(line)

    def cancel(self, run_id: str) -> Run:
        """Cancels a queued or running run (409 if it has ended)."""
        return _parsed(cancel_run.sync_detailed(run_id, client=self._api))

    def artifacts(self, run_id: str) -> list[Artifact]:
        """The files the run's agent left in its output directory
        (``agent.outputs``): each stored one with a short-lived download URL,
        each refused one with the reason (``refused``)."""
        return list(
            _parsed(
                list_run_artifacts.sync_detailed(run_id, client=self._api)
            ).artifacts
        )

    def download(self, run_id: str, path: str) -> bytes:
        """One artifact's bytes, through a freshly signed URL (which needs
        no key while it lasts). 404 ``not_found`` if the run left no stored
        artifact at ``path`` (a refused one has none)."""
        found = [a for a in self.artifacts(run_id) if a.path == path]
        url = found[0].download_url if found else None
        if not isinstance(url, str):
            raise AirlockError(404, "not_found", f"no stored artifact {path!r}")
        # The signed URL alone: the key is not sent with it.
        base = str(self._api.get_httpx_client().base_url).rstrip("/")
        resp = httpx.get(base + url, timeout=self._api.get_httpx_client().timeout)
        if resp.status_code != 200:
            raise _error_of(resp.status_code, resp.content)
        return resp.content


class _Unavailable(Exception):
    def __init__(self, error: AirlockError) -> None:
        super().__init__(str(error))
        self.error = error


class Connections:
    def __init__(self, api: AuthenticatedClient) -> None:
        self._api = api

    def put(
        self, name: str, *, integration: str, type: str, fields: dict[str, str]
    ) -> Connection:
        """Stores a credential under ``name``: creates it, or rotates the secret
        of the connection of that name (whose integration and type must be
        these). Write-only: the answer never holds the secret."""
        new = NewConnection(
            name=name,
            integration=integration,
            type_=NewConnectionType(type),
            fields=NewConnectionFields.from_dict(fields),
        )
        resp = create_connection.sync_detailed(client=self._api, body=new)
        if resp.status_code != 409:
            return _parsed(resp)
        # The name is taken: a rotation, of a connection of the same kind only.
        have: Connection = _parsed(get_connection.sync_detailed(name, client=self._api))
        if have.integration != integration or str(have.type_) != type:
            raise AirlockError(
                409,
                "conflict",
                f"connection {name!r} is of {have.integration} ({have.type_}), "
                f"not {integration} ({type}): delete it first",
            )
        rotate = RotateConnection(fields=RotateConnectionFields.from_dict(fields))
        return _parsed(
            put_connection.sync_detailed(name, client=self._api, body=rotate)
        )


class Client:
    """A client of ``airlock serve``: ``Client("http://127.0.0.1:8420", "alk_…")``.

    ``api`` is the generated client (every route, as
    ``airlock_client.generated.api.<tag>.<operation>``), authenticated with the key.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        reconnects: int = 5,
    ) -> None:
        # A stream may be quiet between events for as long as its keep-alive
        # interval (15 s): reads wait past it.
        self.api = AuthenticatedClient(
            base_url=base_url.rstrip("/"),
            token=api_key,
            timeout=httpx.Timeout(timeout, read=max(timeout, 60.0)),
        )
        self.agents = Agents(self.api)
        self.runs = Runs(self.api, reconnects)
        self.connections = Connections(self.api)

    def close(self) -> None:
        self.api.get_httpx_client().close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
