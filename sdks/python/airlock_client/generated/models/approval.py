from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.approval_state import ApprovalState
from ..types import UNSET, Unset

T = TypeVar("T", bound="Approval")


@_attrs_define
class Approval:
    """A request an `ask` rule held: what it would do (never a credential, a
    header, a query or a body), and its answer.

        Attributes:
            created_at (int):
            expires_at (int): When no answer denies it.
            host (str): The target's host (and port when not the scheme's default).
            id (str):
            method (str):
            path (str): The target's path, without its query.
            rule (str): The `ask` rule that held it.
            run_id (str):
            state (ApprovalState): Where a held request's approval stands (docs/egress.md, "Human approval").
            answered_by (None | str | Unset): The id of the API key that answered, when someone did.
            integration (None | str | Unset): The integration whose rule held it (`null`: the run's network rules).
            settled_at (int | None | Unset): When it stopped being pending.
    """

    created_at: int
    expires_at: int
    host: str
    id: str
    method: str
    path: str
    rule: str
    run_id: str
    state: ApprovalState
    answered_by: None | str | Unset = UNSET
    integration: None | str | Unset = UNSET
    settled_at: int | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at

        expires_at = self.expires_at

        host = self.host

        id = self.id

        method = self.method

        path = self.path

        rule = self.rule

        run_id = self.run_id

        state = self.state.value

        answered_by: None | str | Unset
        if isinstance(self.answered_by, Unset):
            answered_by = UNSET
        else:
            answered_by = self.answered_by

        integration: None | str | Unset
        if isinstance(self.integration, Unset):
            integration = UNSET
        else:
            integration = self.integration

        settled_at: int | None | Unset
        if isinstance(self.settled_at, Unset):
            settled_at = UNSET
        else:
            settled_at = self.settled_at

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "expires_at": expires_at,
                "host": host,
                "id": id,
                "method": method,
                "path": path,
                "rule": rule,
                "run_id": run_id,
                "state": state,
            }
        )
        if answered_by is not UNSET:
            field_dict["answered_by"] = answered_by
        if integration is not UNSET:
            field_dict["integration"] = integration
        if settled_at is not UNSET:
            field_dict["settled_at"] = settled_at

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        created_at = d.pop("created_at")

        expires_at = d.pop("expires_at")

        host = d.pop("host")

        id = d.pop("id")

        method = d.pop("method")

        path = d.pop("path")

        rule = d.pop("rule")

        run_id = d.pop("run_id")

        state = ApprovalState(d.pop("state"))

        def _parse_answered_by(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        answered_by = _parse_answered_by(d.pop("answered_by", UNSET))

        def _parse_integration(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        integration = _parse_integration(d.pop("integration", UNSET))

        def _parse_settled_at(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        settled_at = _parse_settled_at(d.pop("settled_at", UNSET))

        approval = cls(
            created_at=created_at,
            expires_at=expires_at,
            host=host,
            id=id,
            method=method,
            path=path,
            rule=rule,
            run_id=run_id,
            state=state,
            answered_by=answered_by,
            integration=integration,
            settled_at=settled_at,
        )

        approval.additional_properties = d
        return approval

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
