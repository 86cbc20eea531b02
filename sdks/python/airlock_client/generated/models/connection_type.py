from enum import StrEnum


class ConnectionType(StrEnum):
    API_KEY = "api_key"
    BASIC = "basic"
    BEARER = "bearer"
    CUSTOM = "custom"
    OAUTH2 = "oauth2"

    def __str__(self) -> str:
        return str(self.value)
