from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.policy_lists import PolicyLists


T = TypeVar("T", bound="SetRunPolicy")


@_attrs_define
class SetRunPolicy:
    """`PATCH /v1/runs/{id}/policy`: the run's new live rules (replacing every
    list: a list left out withdraws its manifest rules), or `reset` back to
    the manifest's. Give exactly one.

        Attributes:
            expect_version (int | None | Unset): Made only if the live version is still this one (409 otherwise).
            reset (bool | Unset):
            rules (None | PolicyLists | Unset):
    """

    expect_version: int | None | Unset = UNSET
    reset: bool | Unset = UNSET
    rules: None | PolicyLists | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.policy_lists import PolicyLists

        expect_version: int | None | Unset
        if isinstance(self.expect_version, Unset):
            expect_version = UNSET
        else:
            expect_version = self.expect_version

        reset = self.reset

        rules: dict[str, Any] | None | Unset
        if isinstance(self.rules, Unset):
            rules = UNSET
        elif isinstance(self.rules, PolicyLists):
            rules = self.rules.to_dict()
        else:
            rules = self.rules

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if expect_version is not UNSET:
            field_dict["expect_version"] = expect_version
        if reset is not UNSET:
            field_dict["reset"] = reset
        if rules is not UNSET:
            field_dict["rules"] = rules

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.policy_lists import PolicyLists

        d = dict(src_dict)

        def _parse_expect_version(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        expect_version = _parse_expect_version(d.pop("expect_version", UNSET))

        reset = d.pop("reset", UNSET)

        def _parse_rules(data: object) -> None | PolicyLists | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                rules_type_1 = PolicyLists.from_dict(data)

                return rules_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | PolicyLists | Unset, data)

        rules = _parse_rules(d.pop("rules", UNSET))

        set_run_policy = cls(
            expect_version=expect_version,
            reset=reset,
            rules=rules,
        )

        return set_run_policy
