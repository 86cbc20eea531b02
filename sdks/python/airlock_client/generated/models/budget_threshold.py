from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.budget_threshold_budget import BudgetThresholdBudget
from ..models.budget_threshold_measure import BudgetThresholdMeasure

T = TypeVar("T", bound="BudgetThreshold")


@_attrs_define
class BudgetThreshold:
    """A `budget.threshold` event's budget: which one, the threshold its spend
    reached, and the spend and limit then.

        Attributes:
            budget (BudgetThresholdBudget): which budget
            crossed_at (int):
            limit (int): Its limit of `measure`.
            measure (BudgetThresholdMeasure): which measure
            org_id (str):
            period (str): The run's id (a run budget), or `day:YYYY-MM-DD` or `month:YYYY-MM`
                (UTC).
            run_id (str): The run whose model call reached it.
            spent (int): Metered spend of `measure` when it was reached (an organization's:
                settled calls, reservations outstanding left out).
            threshold (float): The fraction of the limit reached.
    """

    budget: BudgetThresholdBudget
    crossed_at: int
    limit: int
    measure: BudgetThresholdMeasure
    org_id: str
    period: str
    run_id: str
    spent: int
    threshold: float
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        budget = self.budget.value

        crossed_at = self.crossed_at

        limit = self.limit

        measure = self.measure.value

        org_id = self.org_id

        period = self.period

        run_id = self.run_id

        spent = self.spent

        threshold = self.threshold

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "budget": budget,
                "crossed_at": crossed_at,
                "limit": limit,
                "measure": measure,
                "org_id": org_id,
                "period": period,
                "run_id": run_id,
                "spent": spent,
                "threshold": threshold,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        budget = BudgetThresholdBudget(d.pop("budget"))

        crossed_at = d.pop("crossed_at")

        limit = d.pop("limit")

        measure = BudgetThresholdMeasure(d.pop("measure"))

        org_id = d.pop("org_id")

        period = d.pop("period")

        run_id = d.pop("run_id")

        spent = d.pop("spent")

        threshold = d.pop("threshold")

        budget_threshold = cls(
            budget=budget,
            crossed_at=crossed_at,
            limit=limit,
            measure=measure,
            org_id=org_id,
            period=period,
            run_id=run_id,
            spent=spent,
            threshold=threshold,
        )

        budget_threshold.additional_properties = d
        return budget_threshold

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
