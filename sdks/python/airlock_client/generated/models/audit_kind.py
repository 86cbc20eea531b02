from enum import StrEnum


class AuditKind(StrEnum):
    APPROVAL = "approval"
    EGRESS = "egress"
    POLICY_CHANGE = "policy_change"
    REFUSALS = "refusals"
    TOOL_EXCLUDED = "tool_excluded"

    def __str__(self) -> str:
        return str(self.value)
