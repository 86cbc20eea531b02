from enum import StrEnum


class GetRunAuditFormat(StrEnum):
    AIRLOCK = "airlock"
    OCSF = "ocsf"

    def __str__(self) -> str:
        return str(self.value)
