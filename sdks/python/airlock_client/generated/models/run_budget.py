from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.budget_limits import BudgetLimits
    from ..models.run_spend import RunSpend


T = TypeVar("T", bound="RunBudget")


@_attrs_define
class RunBudget:
    """A run's model budget: the limits it is held to (its manifest's
    `[budget]` within the operator's ceilings; `null`: not limited) and what
    it spent against them. Its organization's budgets are `GET /v1/org/budget`'s.

        Attributes:
            limits (BudgetLimits): A budget period's limits on the organization's model calls; `null`:
                that measure is not limited. Every limit is at least 1.
            spend (RunSpend): What a run's model calls spent: tokens input and output together,
                cost at the model's prices, metered requests.
    """

    limits: BudgetLimits
    spend: RunSpend
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        limits = self.limits.to_dict()

        spend = self.spend.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "limits": limits,
                "spend": spend,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.budget_limits import BudgetLimits
        from ..models.run_spend import RunSpend

        d = dict(src_dict)
        limits = BudgetLimits.from_dict(d.pop("limits"))

        spend = RunSpend.from_dict(d.pop("spend"))

        run_budget = cls(
            limits=limits,
            spend=spend,
        )

        run_budget.additional_properties = d
        return run_budget

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
