from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="CostCall")


@_attrs_define
class CostCall:
    """One model call of a run, as the platform recorded it.

    Attributes:
        at (int):
        model (str):
        provider (str):
        tokens_in (int):
        tokens_out (int):
        unmetered (bool): The provider's usage never arrived or was not believable: the
            numbers are what the relay saw, possibly none.
        cost_microusd (int | None | Unset): Millionths of a US dollar; `null` when the model's price is unknown.
        paid_by (None | str | Unset): Which key paid, as the platform handed it (never the key):
            `manifest:<connection>`, `organization:<connection>` or
            `system:<provider>`; `null` when no handout was recorded before the
            call (a run from before this was recorded).
    """

    at: int
    model: str
    provider: str
    tokens_in: int
    tokens_out: int
    unmetered: bool
    cost_microusd: int | None | Unset = UNSET
    paid_by: None | str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        at = self.at

        model = self.model

        provider = self.provider

        tokens_in = self.tokens_in

        tokens_out = self.tokens_out

        unmetered = self.unmetered

        cost_microusd: int | None | Unset
        if isinstance(self.cost_microusd, Unset):
            cost_microusd = UNSET
        else:
            cost_microusd = self.cost_microusd

        paid_by: None | str | Unset
        if isinstance(self.paid_by, Unset):
            paid_by = UNSET
        else:
            paid_by = self.paid_by

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "at": at,
                "model": model,
                "provider": provider,
                "tokens_in": tokens_in,
                "tokens_out": tokens_out,
                "unmetered": unmetered,
            }
        )
        if cost_microusd is not UNSET:
            field_dict["cost_microusd"] = cost_microusd
        if paid_by is not UNSET:
            field_dict["paid_by"] = paid_by

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        at = d.pop("at")

        model = d.pop("model")

        provider = d.pop("provider")

        tokens_in = d.pop("tokens_in")

        tokens_out = d.pop("tokens_out")

        unmetered = d.pop("unmetered")

        def _parse_cost_microusd(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        cost_microusd = _parse_cost_microusd(d.pop("cost_microusd", UNSET))

        def _parse_paid_by(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        paid_by = _parse_paid_by(d.pop("paid_by", UNSET))

        cost_call = cls(
            at=at,
            model=model,
            provider=provider,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            unmetered=unmetered,
            cost_microusd=cost_microusd,
            paid_by=paid_by,
        )

        cost_call.additional_properties = d
        return cost_call

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
