from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

from ..models.approval_decision import ApprovalDecision

T = TypeVar("T", bound="AnswerApproval")


@_attrs_define
class AnswerApproval:
    """`POST /v1/runs/{id}/approvals/{approval_id}`.

    Attributes:
        decision (ApprovalDecision): A person's answer to a held request.
    """

    decision: ApprovalDecision

    def to_dict(self) -> dict[str, Any]:
        decision = self.decision.value

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "decision": decision,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        decision = ApprovalDecision(d.pop("decision"))

        answer_approval = cls(
            decision=decision,
        )

        return answer_approval
