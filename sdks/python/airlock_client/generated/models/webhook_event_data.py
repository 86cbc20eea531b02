from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.approval import Approval
    from ..models.budget_threshold import BudgetThreshold
    from ..models.run import Run


T = TypeVar("T", bound="WebhookEventData")


@_attrs_define
class WebhookEventData:
    """
    Attributes:
        run (Run): A run. Also the `end` event of an event stream, and a webhook's `data.run`.
        approval (Approval | None | Unset):
        budget (BudgetThreshold | None | Unset):
    """

    run: Run
    approval: Approval | None | Unset = UNSET
    budget: BudgetThreshold | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.approval import Approval
        from ..models.budget_threshold import BudgetThreshold

        run = self.run.to_dict()

        approval: dict[str, Any] | None | Unset
        if isinstance(self.approval, Unset):
            approval = UNSET
        elif isinstance(self.approval, Approval):
            approval = self.approval.to_dict()
        else:
            approval = self.approval

        budget: dict[str, Any] | None | Unset
        if isinstance(self.budget, Unset):
            budget = UNSET
        elif isinstance(self.budget, BudgetThreshold):
            budget = self.budget.to_dict()
        else:
            budget = self.budget

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "run": run,
            }
        )
        if approval is not UNSET:
            field_dict["approval"] = approval
        if budget is not UNSET:
            field_dict["budget"] = budget

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.approval import Approval
        from ..models.budget_threshold import BudgetThreshold
        from ..models.run import Run

        d = dict(src_dict)
        run = Run.from_dict(d.pop("run"))

        def _parse_approval(data: object) -> Approval | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                approval_type_1 = Approval.from_dict(data)

                return approval_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(Approval | None | Unset, data)

        approval = _parse_approval(d.pop("approval", UNSET))

        def _parse_budget(data: object) -> BudgetThreshold | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                budget_type_1 = BudgetThreshold.from_dict(data)

                return budget_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(BudgetThreshold | None | Unset, data)

        budget = _parse_budget(d.pop("budget", UNSET))

        webhook_event_data = cls(
            run=run,
            approval=approval,
            budget=budget,
        )

        webhook_event_data.additional_properties = d
        return webhook_event_data

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
