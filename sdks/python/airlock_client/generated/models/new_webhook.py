from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

from ..models.new_webhook_events_item import NewWebhookEventsItem

T = TypeVar("T", bound="NewWebhook")


@_attrs_define
class NewWebhook:
    """`POST /v1/webhooks`.

    Attributes:
        events (list[NewWebhookEventsItem]):
        url (str): Judged by the egress guard now and at every delivery.
    """

    events: list[NewWebhookEventsItem]
    url: str

    def to_dict(self) -> dict[str, Any]:
        events = []
        for events_item_data in self.events:
            events_item = events_item_data.value
            events.append(events_item)

        url = self.url

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "events": events,
                "url": url,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        events = []
        _events = d.pop("events")
        for events_item_data in _events:
            events_item = NewWebhookEventsItem(events_item_data)

            events.append(events_item)

        url = d.pop("url")

        new_webhook = cls(
            events=events,
            url=url,
        )

        return new_webhook
