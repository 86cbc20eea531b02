from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.new_run_files import NewRunFiles
    from ..models.run_limits import RunLimits


T = TypeVar("T", bound="NewRun")


@_attrs_define
class NewRun:
    """`POST /v1/runs`.

    Attributes:
        agent (str): A registered agent's name.
        files (NewRunFiles | Unset): The run's input files: relative path → UTF-8 content, placed in the
            agent's workspace (`$AIRLOCK_WORKSPACE/<path>`) before it starts.
            Paths are checked as a bundle's; at most 64 files, 1 MiB each, 4 MiB
            in all.
        limits (None | RunLimits | Unset):
        prompt (None | str | Unset): The run's prompt (at most 256 KiB).
    """

    agent: str
    files: NewRunFiles | Unset = UNSET
    limits: None | RunLimits | Unset = UNSET
    prompt: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.run_limits import RunLimits

        agent = self.agent

        files: dict[str, Any] | Unset = UNSET
        if not isinstance(self.files, Unset):
            files = self.files.to_dict()

        limits: dict[str, Any] | None | Unset
        if isinstance(self.limits, Unset):
            limits = UNSET
        elif isinstance(self.limits, RunLimits):
            limits = self.limits.to_dict()
        else:
            limits = self.limits

        prompt: None | str | Unset
        if isinstance(self.prompt, Unset):
            prompt = UNSET
        else:
            prompt = self.prompt

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "agent": agent,
            }
        )
        if files is not UNSET:
            field_dict["files"] = files
        if limits is not UNSET:
            field_dict["limits"] = limits
        if prompt is not UNSET:
            field_dict["prompt"] = prompt

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.new_run_files import NewRunFiles
        from ..models.run_limits import RunLimits

        d = dict(src_dict)
        agent = d.pop("agent")

        _files = d.pop("files", UNSET)
        files: NewRunFiles | Unset
        if isinstance(_files, Unset):
            files = UNSET
        else:
            files = NewRunFiles.from_dict(_files)

        def _parse_limits(data: object) -> None | RunLimits | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                limits_type_1 = RunLimits.from_dict(data)

                return limits_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | RunLimits | Unset, data)

        limits = _parse_limits(d.pop("limits", UNSET))

        def _parse_prompt(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        prompt = _parse_prompt(d.pop("prompt", UNSET))

        new_run = cls(
            agent=agent,
            files=files,
            limits=limits,
            prompt=prompt,
        )

        return new_run
