from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.answer_approval import AnswerApproval
from ...models.approval import Approval
from ...models.error import Error
from ...types import Response


def _get_kwargs(
    id: str,
    approval_id: str,
    *,
    body: AnswerApproval,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/runs/{id}/approvals/{approval_id}".format(
            id=quote(str(id), safe=""),
            approval_id=quote(str(approval_id), safe=""),
        ),
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Approval | Error | None:
    if response.status_code == 200:
        response_200 = Approval.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = Error.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    if response.status_code == 404:
        response_404 = Error.from_dict(response.json())

        return response_404

    if response.status_code == 409:
        response_409 = Error.from_dict(response.json())

        return response_409

    if response.status_code == 413:
        response_413 = Error.from_dict(response.json())

        return response_413

    if response.status_code == 415:
        response_415 = Error.from_dict(response.json())

        return response_415

    if response.status_code == 422:
        response_422 = Error.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = Error.from_dict(response.json())

        return response_429

    if response.status_code == 500:
        response_500 = Error.from_dict(response.json())

        return response_500

    if response.status_code == 503:
        response_503 = Error.from_dict(response.json())

        return response_503

    if response.status_code == 507:
        response_507 = Error.from_dict(response.json())

        return response_507

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Approval | Error]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    id: str,
    approval_id: str,
    *,
    client: AuthenticatedClient,
    body: AnswerApproval,
) -> Response[Approval | Error]:
    """Answers a held request: allow it once, allow it (and every later
    request of the run matching the same rule, method and host) for the
    run, or deny it. The answer and the key that gave it are in the run's
    audit.

    Args:
        id (str):
        approval_id (str):
        body (AnswerApproval): `POST /v1/runs/{id}/approvals/{approval_id}`.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Approval | Error]
    """

    kwargs = _get_kwargs(
        id=id,
        approval_id=approval_id,
        body=body,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    id: str,
    approval_id: str,
    *,
    client: AuthenticatedClient,
    body: AnswerApproval,
) -> Approval | Error | None:
    """Answers a held request: allow it once, allow it (and every later
    request of the run matching the same rule, method and host) for the
    run, or deny it. The answer and the key that gave it are in the run's
    audit.

    Args:
        id (str):
        approval_id (str):
        body (AnswerApproval): `POST /v1/runs/{id}/approvals/{approval_id}`.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Approval | Error
    """

    return sync_detailed(
        id=id,
        approval_id=approval_id,
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    id: str,
    approval_id: str,
    *,
    client: AuthenticatedClient,
    body: AnswerApproval,
) -> Response[Approval | Error]:
    """Answers a held request: allow it once, allow it (and every later
    request of the run matching the same rule, method and host) for the
    run, or deny it. The answer and the key that gave it are in the run's
    audit.

    Args:
        id (str):
        approval_id (str):
        body (AnswerApproval): `POST /v1/runs/{id}/approvals/{approval_id}`.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Approval | Error]
    """

    kwargs = _get_kwargs(
        id=id,
        approval_id=approval_id,
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    id: str,
    approval_id: str,
    *,
    client: AuthenticatedClient,
    body: AnswerApproval,
) -> Approval | Error | None:
    """Answers a held request: allow it once, allow it (and every later
    request of the run matching the same rule, method and host) for the
    run, or deny it. The answer and the key that gave it are in the run's
    audit.

    Args:
        id (str):
        approval_id (str):
        body (AnswerApproval): `POST /v1/runs/{id}/approvals/{approval_id}`.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Approval | Error
    """

    return (
        await asyncio_detailed(
            id=id,
            approval_id=approval_id,
            client=client,
            body=body,
        )
    ).parsed
