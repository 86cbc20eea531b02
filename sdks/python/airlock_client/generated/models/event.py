from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.event_payload import EventPayload


T = TypeVar("T", bound="Event")


@_attrs_define
class Event:
    """One stored event of a run.

    Attributes:
        at (int):
        id (int):
        kind (str): `log`, `shed`, `result`, `cost`, …
        payload (EventPayload): The event as the run reported it (a JSON object; its text if it is
            not JSON).
    """

    at: int
    id: int
    kind: str
    payload: EventPayload
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        at = self.at

        id = self.id

        kind = self.kind

        payload = self.payload.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "at": at,
                "id": id,
                "kind": kind,
                "payload": payload,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.event_payload import EventPayload

        d = dict(src_dict)
        at = d.pop("at")

        id = d.pop("id")

        kind = d.pop("kind")

        payload = EventPayload.from_dict(d.pop("payload"))

        event = cls(
            at=at,
            id=id,
            kind=kind,
            payload=payload,
        )

        event.additional_properties = d
        return event

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
