from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="BudgetLimits")


@_attrs_define
class BudgetLimits:
    """A budget period's limits on the organization's model calls; `null`:
    that measure is not limited. Every limit is at least 1.

        Attributes:
            cost_microusd (int | None | Unset): Millionths of a US dollar, at each model's prices.
            requests (int | None | Unset): Model requests.
            tokens (int | None | Unset): Tokens, input and output together.
    """

    cost_microusd: int | None | Unset = UNSET
    requests: int | None | Unset = UNSET
    tokens: int | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        cost_microusd: int | None | Unset
        if isinstance(self.cost_microusd, Unset):
            cost_microusd = UNSET
        else:
            cost_microusd = self.cost_microusd

        requests: int | None | Unset
        if isinstance(self.requests, Unset):
            requests = UNSET
        else:
            requests = self.requests

        tokens: int | None | Unset
        if isinstance(self.tokens, Unset):
            tokens = UNSET
        else:
            tokens = self.tokens

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if cost_microusd is not UNSET:
            field_dict["cost_microusd"] = cost_microusd
        if requests is not UNSET:
            field_dict["requests"] = requests
        if tokens is not UNSET:
            field_dict["tokens"] = tokens

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)

        def _parse_cost_microusd(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        cost_microusd = _parse_cost_microusd(d.pop("cost_microusd", UNSET))

        def _parse_requests(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        requests = _parse_requests(d.pop("requests", UNSET))

        def _parse_tokens(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        tokens = _parse_tokens(d.pop("tokens", UNSET))

        budget_limits = cls(
            cost_microusd=cost_microusd,
            requests=requests,
            tokens=tokens,
        )

        return budget_limits
