from enum import StrEnum


class ApprovalDecision(StrEnum):
    ALLOW_ONCE = "allow_once"
    ALLOW_RUN = "allow_run"
    DENY = "deny"

    def __str__(self) -> str:
        return str(self.value)
