from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.audit_decider import AuditDecider
from ..models.audit_decision import AuditDecision
from ..models.audit_kind import AuditKind
from ..types import UNSET, Unset

T = TypeVar("T", bound="AuditRecord")


@_attrs_define
class AuditRecord:
    """One decision of a run's audit: a line of `audit.jsonl`.

    Attributes:
        at (int): Unix ms.
        bytes_in (int): Bytes received from upstream.
        bytes_out (int): Bytes sent upstream.
        decider (AuditDecider): Who decided.
        decision (AuditDecision): The decision.
        id (str): `egress:<n>` or `event:<n>`: unique within the run, the same in
            every export.
        kind (AuditKind): What a record is a decision about.
        run_id (str):
        schema_version (int): [`AUDIT_SCHEMA_VERSION`].
        actor (None | str | Unset): A policy change: who made it (`key <id>`).
        answered_by (None | str | Unset): An approval's settlement: the id of the API key that answered
            (`null` when no one did: it expired or its run ended).
        approval_id (None | str | Unset): An approval's id (`approval` records).
        called (bool | None | Unset): A tool exclusion: whether the tool was called by name (`false`:
            left out of a list).
        code (None | str | Unset): A refusal's code (`docs/egress.md`); `null` otherwise.
        count (int | None | Unset): `refusals`: how many were counted.
        duration_ms (int | None | Unset): How long the request took upstream, when it was sent.
        host (None | str | Unset):
        integration (None | str | Unset):
        method (None | str | Unset):
        new_rules (list[str] | None | Unset): A policy change: each rule (`list:id`) in force after it.
        old_rules (list[str] | None | Unset): A policy change: each rule (`list:id`) in force before it.
        outcome (None | str | Unset): What became of an allowed request (`completed`, `upstream_failed`,
            `incomplete`, …).
        plane (None | str | Unset): The path that carried an egress request to the guard: `api` (the
            sidecar made the call), `proxy` (the client's own connection through
            the forward proxy), `transparent` (carried by the transparent plane).
        rule (None | str | Unset): The L7 rule that refused the request.
        source (None | str | Unset): The egress path: `api_call`, `proxy`, `llm`, `mcp`, `runner`.
        status (int | None | Unset): The upstream's HTTP status.
        tool (None | str | Unset): A tool exclusion: the tool's name as the integration's server (or
            the agent's call) named it.
        url (None | str | Unset): Free of credentials.
        version (int | None | Unset): A policy change: the version it made (0: the manifest's rules).
    """

    at: int
    bytes_in: int
    bytes_out: int
    decider: AuditDecider
    decision: AuditDecision
    id: str
    kind: AuditKind
    run_id: str
    schema_version: int
    actor: None | str | Unset = UNSET
    answered_by: None | str | Unset = UNSET
    approval_id: None | str | Unset = UNSET
    called: bool | None | Unset = UNSET
    code: None | str | Unset = UNSET
    count: int | None | Unset = UNSET
    duration_ms: int | None | Unset = UNSET
    host: None | str | Unset = UNSET
    integration: None | str | Unset = UNSET
    method: None | str | Unset = UNSET
    new_rules: list[str] | None | Unset = UNSET
    old_rules: list[str] | None | Unset = UNSET
    outcome: None | str | Unset = UNSET
    plane: None | str | Unset = UNSET
    rule: None | str | Unset = UNSET
    source: None | str | Unset = UNSET
    status: int | None | Unset = UNSET
    tool: None | str | Unset = UNSET
    url: None | str | Unset = UNSET
    version: int | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        at = self.at

        bytes_in = self.bytes_in

        bytes_out = self.bytes_out

        decider = self.decider.value

        decision = self.decision.value

        id = self.id

        kind = self.kind.value

        run_id = self.run_id

        schema_version = self.schema_version

        actor: None | str | Unset
        if isinstance(self.actor, Unset):
            actor = UNSET
        else:
            actor = self.actor

        answered_by: None | str | Unset
        if isinstance(self.answered_by, Unset):
            answered_by = UNSET
        else:
            answered_by = self.answered_by

        approval_id: None | str | Unset
        if isinstance(self.approval_id, Unset):
            approval_id = UNSET
        else:
            approval_id = self.approval_id

        called: bool | None | Unset
        if isinstance(self.called, Unset):
            called = UNSET
        else:
            called = self.called

        code: None | str | Unset
        if isinstance(self.code, Unset):
            code = UNSET
        else:
            code = self.code

        count: int | None | Unset
        if isinstance(self.count, Unset):
            count = UNSET
        else:
            count = self.count

        duration_ms: int | None | Unset
        if isinstance(self.duration_ms, Unset):
            duration_ms = UNSET
        else:
            duration_ms = self.duration_ms

        host: None | str | Unset
        if isinstance(self.host, Unset):
            host = UNSET
        else:
            host = self.host

        integration: None | str | Unset
        if isinstance(self.integration, Unset):
            integration = UNSET
        else:
            integration = self.integration

        method: None | str | Unset
        if isinstance(self.method, Unset):
            method = UNSET
        else:
            method = self.method

        new_rules: list[str] | None | Unset
        if isinstance(self.new_rules, Unset):
            new_rules = UNSET
        elif isinstance(self.new_rules, list):
            new_rules = self.new_rules

        else:
            new_rules = self.new_rules

        old_rules: list[str] | None | Unset
        if isinstance(self.old_rules, Unset):
            old_rules = UNSET
        elif isinstance(self.old_rules, list):
            old_rules = self.old_rules

        else:
            old_rules = self.old_rules

        outcome: None | str | Unset
        if isinstance(self.outcome, Unset):
            outcome = UNSET
        else:
            outcome = self.outcome

        plane: None | str | Unset
        if isinstance(self.plane, Unset):
            plane = UNSET
        else:
            plane = self.plane

        rule: None | str | Unset
        if isinstance(self.rule, Unset):
            rule = UNSET
        else:
            rule = self.rule

        source: None | str | Unset
        if isinstance(self.source, Unset):
            source = UNSET
        else:
            source = self.source

        status: int | None | Unset
        if isinstance(self.status, Unset):
            status = UNSET
        else:
            status = self.status

        tool: None | str | Unset
        if isinstance(self.tool, Unset):
            tool = UNSET
        else:
            tool = self.tool

        url: None | str | Unset
        if isinstance(self.url, Unset):
            url = UNSET
        else:
            url = self.url

        version: int | None | Unset
        if isinstance(self.version, Unset):
            version = UNSET
        else:
            version = self.version

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "at": at,
                "bytes_in": bytes_in,
                "bytes_out": bytes_out,
                "decider": decider,
                "decision": decision,
                "id": id,
                "kind": kind,
                "run_id": run_id,
                "schema_version": schema_version,
            }
        )
        if actor is not UNSET:
            field_dict["actor"] = actor
        if answered_by is not UNSET:
            field_dict["answered_by"] = answered_by
        if approval_id is not UNSET:
            field_dict["approval_id"] = approval_id
        if called is not UNSET:
            field_dict["called"] = called
        if code is not UNSET:
            field_dict["code"] = code
        if count is not UNSET:
            field_dict["count"] = count
        if duration_ms is not UNSET:
            field_dict["duration_ms"] = duration_ms
        if host is not UNSET:
            field_dict["host"] = host
        if integration is not UNSET:
            field_dict["integration"] = integration
        if method is not UNSET:
            field_dict["method"] = method
        if new_rules is not UNSET:
            field_dict["new_rules"] = new_rules
        if old_rules is not UNSET:
            field_dict["old_rules"] = old_rules
        if outcome is not UNSET:
            field_dict["outcome"] = outcome
        if plane is not UNSET:
            field_dict["plane"] = plane
        if rule is not UNSET:
            field_dict["rule"] = rule
        if source is not UNSET:
            field_dict["source"] = source
        if status is not UNSET:
            field_dict["status"] = status
        if tool is not UNSET:
            field_dict["tool"] = tool
        if url is not UNSET:
            field_dict["url"] = url
        if version is not UNSET:
            field_dict["version"] = version

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        at = d.pop("at")

        bytes_in = d.pop("bytes_in")

        bytes_out = d.pop("bytes_out")

        decider = AuditDecider(d.pop("decider"))

        decision = AuditDecision(d.pop("decision"))

        id = d.pop("id")

        kind = AuditKind(d.pop("kind"))

        run_id = d.pop("run_id")

        schema_version = d.pop("schema_version")

        def _parse_actor(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        actor = _parse_actor(d.pop("actor", UNSET))

        def _parse_answered_by(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        answered_by = _parse_answered_by(d.pop("answered_by", UNSET))

        def _parse_approval_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        approval_id = _parse_approval_id(d.pop("approval_id", UNSET))

        def _parse_called(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        called = _parse_called(d.pop("called", UNSET))

        def _parse_code(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        code = _parse_code(d.pop("code", UNSET))

        def _parse_count(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        count = _parse_count(d.pop("count", UNSET))

        def _parse_duration_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        duration_ms = _parse_duration_ms(d.pop("duration_ms", UNSET))

        def _parse_host(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        host = _parse_host(d.pop("host", UNSET))

        def _parse_integration(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        integration = _parse_integration(d.pop("integration", UNSET))

        def _parse_method(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        method = _parse_method(d.pop("method", UNSET))

        def _parse_new_rules(data: object) -> list[str] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                new_rules_type_0 = cast(list[str], data)

                return new_rules_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[str] | None | Unset, data)

        new_rules = _parse_new_rules(d.pop("new_rules", UNSET))

        def _parse_old_rules(data: object) -> list[str] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                old_rules_type_0 = cast(list[str], data)

                return old_rules_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[str] | None | Unset, data)

        old_rules = _parse_old_rules(d.pop("old_rules", UNSET))

        def _parse_outcome(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        outcome = _parse_outcome(d.pop("outcome", UNSET))

        def _parse_plane(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        plane = _parse_plane(d.pop("plane", UNSET))

        def _parse_rule(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        rule = _parse_rule(d.pop("rule", UNSET))

        def _parse_source(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        source = _parse_source(d.pop("source", UNSET))

        def _parse_status(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        status = _parse_status(d.pop("status", UNSET))

        def _parse_tool(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        tool = _parse_tool(d.pop("tool", UNSET))

        def _parse_url(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        url = _parse_url(d.pop("url", UNSET))

        def _parse_version(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        version = _parse_version(d.pop("version", UNSET))

        audit_record = cls(
            at=at,
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            decider=decider,
            decision=decision,
            id=id,
            kind=kind,
            run_id=run_id,
            schema_version=schema_version,
            actor=actor,
            answered_by=answered_by,
            approval_id=approval_id,
            called=called,
            code=code,
            count=count,
            duration_ms=duration_ms,
            host=host,
            integration=integration,
            method=method,
            new_rules=new_rules,
            old_rules=old_rules,
            outcome=outcome,
            plane=plane,
            rule=rule,
            source=source,
            status=status,
            tool=tool,
            url=url,
            version=version,
        )

        audit_record.additional_properties = d
        return audit_record

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
