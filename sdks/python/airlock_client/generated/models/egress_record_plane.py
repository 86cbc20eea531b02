from enum import StrEnum


class EgressRecordPlane(StrEnum):
    API = "api"
    PROXY = "proxy"
    TRANSPARENT = "transparent"

    def __str__(self) -> str:
        return str(self.value)
