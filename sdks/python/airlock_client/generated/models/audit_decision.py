from enum import StrEnum


class AuditDecision(StrEnum):
    ALLOWED = "allowed"
    CHANGED = "changed"
    HIDDEN = "hidden"
    REFUSED = "refused"

    def __str__(self) -> str:
        return str(self.value)
