from enum import StrEnum


class ApprovalState(StrEnum):
    ALLOWED_ONCE = "allowed_once"
    ALLOWED_RUN = "allowed_run"
    DENIED = "denied"
    DROPPED = "dropped"
    EXPIRED = "expired"
    PENDING = "pending"

    def __str__(self) -> str:
        return str(self.value)
