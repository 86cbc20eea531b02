from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.policy_lists import PolicyLists


T = TypeVar("T", bound="RunPolicy")


@_attrs_define
class RunPolicy:
    """`GET /v1/runs/{id}/policy`: a run's live egress rules.

    Attributes:
        actor (str): Who made the live version: `manifest` (version 0), else `key <id>`.
        applied_version (int): The version the run's sidecar reported applied.
        manifest (PolicyLists): Every rule list of a run: the network list's and each integration's
            (by namespace).
        rules (PolicyLists): Every rule list of a run: the network list's and each integration's
            (by namespace).
        version (int): 0: the manifest's; each change adds one.
        at (int | None | Unset): When the live version was made (`null`: version 0 of a run whose
            manifest has no rules).
    """

    actor: str
    applied_version: int
    manifest: PolicyLists
    rules: PolicyLists
    version: int
    at: int | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        actor = self.actor

        applied_version = self.applied_version

        manifest = self.manifest.to_dict()

        rules = self.rules.to_dict()

        version = self.version

        at: int | None | Unset
        if isinstance(self.at, Unset):
            at = UNSET
        else:
            at = self.at

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "actor": actor,
                "applied_version": applied_version,
                "manifest": manifest,
                "rules": rules,
                "version": version,
            }
        )
        if at is not UNSET:
            field_dict["at"] = at

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.policy_lists import PolicyLists

        d = dict(src_dict)
        actor = d.pop("actor")

        applied_version = d.pop("applied_version")

        manifest = PolicyLists.from_dict(d.pop("manifest"))

        rules = PolicyLists.from_dict(d.pop("rules"))

        version = d.pop("version")

        def _parse_at(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        at = _parse_at(d.pop("at", UNSET))

        run_policy = cls(
            actor=actor,
            applied_version=applied_version,
            manifest=manifest,
            rules=rules,
            version=version,
            at=at,
        )

        run_policy.additional_properties = d
        return run_policy

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
