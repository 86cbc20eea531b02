from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.egress_record_plane import EgressRecordPlane
from ..types import UNSET, Unset

T = TypeVar("T", bound="EgressRecord")


@_attrs_define
class EgressRecord:
    """One request that left a run's sandbox, or one refusal.

    Attributes:
        at (int):
        bytes_in (int):
        bytes_out (int):
        decision (str): `allowed` or `refused`.
        host (str):
        method (str):
        plane (EgressRecordPlane): the path that carried the request to the guard
        source (str): `api_call`, `proxy`, `llm`, …
        url (str): Free of credentials.
        duration_ms (int | None | Unset):
        integration (None | str | Unset):
        metering (None | str | Unset): Model calls: `metered`, or `unmetered` when the provider's usage
            never arrived (`null` for other requests).
        outcome (None | str | Unset): What became of an allowed request (`null` for a refusal).
        reason (None | str | Unset): The guard's refusal code.
        rule (None | str | Unset): The id of the L7 rule that refused it (`rule_refused`; a tunnel a
            live change closed too), else `null`.
        seq (int | None | Unset): Its number within the run.
        status (int | None | Unset): The upstream's HTTP status.
    """

    at: int
    bytes_in: int
    bytes_out: int
    decision: str
    host: str
    method: str
    plane: EgressRecordPlane
    source: str
    url: str
    duration_ms: int | None | Unset = UNSET
    integration: None | str | Unset = UNSET
    metering: None | str | Unset = UNSET
    outcome: None | str | Unset = UNSET
    reason: None | str | Unset = UNSET
    rule: None | str | Unset = UNSET
    seq: int | None | Unset = UNSET
    status: int | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        at = self.at

        bytes_in = self.bytes_in

        bytes_out = self.bytes_out

        decision = self.decision

        host = self.host

        method = self.method

        plane = self.plane.value

        source = self.source

        url = self.url

        duration_ms: int | None | Unset
        if isinstance(self.duration_ms, Unset):
            duration_ms = UNSET
        else:
            duration_ms = self.duration_ms

        integration: None | str | Unset
        if isinstance(self.integration, Unset):
            integration = UNSET
        else:
            integration = self.integration

        metering: None | str | Unset
        if isinstance(self.metering, Unset):
            metering = UNSET
        else:
            metering = self.metering

        outcome: None | str | Unset
        if isinstance(self.outcome, Unset):
            outcome = UNSET
        else:
            outcome = self.outcome

        reason: None | str | Unset
        if isinstance(self.reason, Unset):
            reason = UNSET
        else:
            reason = self.reason

        rule: None | str | Unset
        if isinstance(self.rule, Unset):
            rule = UNSET
        else:
            rule = self.rule

        seq: int | None | Unset
        if isinstance(self.seq, Unset):
            seq = UNSET
        else:
            seq = self.seq

        status: int | None | Unset
        if isinstance(self.status, Unset):
            status = UNSET
        else:
            status = self.status

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "at": at,
                "bytes_in": bytes_in,
                "bytes_out": bytes_out,
                "decision": decision,
                "host": host,
                "method": method,
                "plane": plane,
                "source": source,
                "url": url,
            }
        )
        if duration_ms is not UNSET:
            field_dict["duration_ms"] = duration_ms
        if integration is not UNSET:
            field_dict["integration"] = integration
        if metering is not UNSET:
            field_dict["metering"] = metering
        if outcome is not UNSET:
            field_dict["outcome"] = outcome
        if reason is not UNSET:
            field_dict["reason"] = reason
        if rule is not UNSET:
            field_dict["rule"] = rule
        if seq is not UNSET:
            field_dict["seq"] = seq
        if status is not UNSET:
            field_dict["status"] = status

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        at = d.pop("at")

        bytes_in = d.pop("bytes_in")

        bytes_out = d.pop("bytes_out")

        decision = d.pop("decision")

        host = d.pop("host")

        method = d.pop("method")

        plane = EgressRecordPlane(d.pop("plane"))

        source = d.pop("source")

        url = d.pop("url")

        def _parse_duration_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        duration_ms = _parse_duration_ms(d.pop("duration_ms", UNSET))

        def _parse_integration(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        integration = _parse_integration(d.pop("integration", UNSET))

        def _parse_metering(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        metering = _parse_metering(d.pop("metering", UNSET))

        def _parse_outcome(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        outcome = _parse_outcome(d.pop("outcome", UNSET))

        def _parse_reason(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        reason = _parse_reason(d.pop("reason", UNSET))

        def _parse_rule(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        rule = _parse_rule(d.pop("rule", UNSET))

        def _parse_seq(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        seq = _parse_seq(d.pop("seq", UNSET))

        def _parse_status(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        status = _parse_status(d.pop("status", UNSET))

        egress_record = cls(
            at=at,
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            decision=decision,
            host=host,
            method=method,
            plane=plane,
            source=source,
            url=url,
            duration_ms=duration_ms,
            integration=integration,
            metering=metering,
            outcome=outcome,
            reason=reason,
            rule=rule,
            seq=seq,
            status=status,
        )

        egress_record.additional_properties = d
        return egress_record

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
