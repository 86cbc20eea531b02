from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.new_webhook_answer_events_item import NewWebhookAnswerEventsItem

T = TypeVar("T", bound="NewWebhookAnswer")


@_attrs_define
class NewWebhookAnswer:
    """A new webhook, with its signing secret: shown in this answer only.

    Attributes:
        created_at (int):
        events (list[NewWebhookAnswerEventsItem]):
        id (str):
        secret (str): `whsec_…`: the signing secret, in this answer only.
        url (str):
    """

    created_at: int
    events: list[NewWebhookAnswerEventsItem]
    id: str
    secret: str
    url: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at

        events = []
        for events_item_data in self.events:
            events_item = events_item_data.value
            events.append(events_item)

        id = self.id

        secret = self.secret

        url = self.url

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "events": events,
                "id": id,
                "secret": secret,
                "url": url,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        created_at = d.pop("created_at")

        events = []
        _events = d.pop("events")
        for events_item_data in _events:
            events_item = NewWebhookAnswerEventsItem(events_item_data)

            events.append(events_item)

        id = d.pop("id")

        secret = d.pop("secret")

        url = d.pop("url")

        new_webhook_answer = cls(
            created_at=created_at,
            events=events,
            id=id,
            secret=secret,
            url=url,
        )

        new_webhook_answer.additional_properties = d
        return new_webhook_answer

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
