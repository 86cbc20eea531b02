"""A client of ``airlock serve``'s API.

``airlock_client.generated`` is generated from the API's OpenAPI document
(openapi-python-client, by ``sdks/generate.sh``); :class:`Client` is the
run-centric facade over it::

    from airlock_client import Client

    with Client("http://127.0.0.1:8420", api_key) as airlock:
        airlock.agents.register("examples/hello")
        run = airlock.runs.create("hello", "say hi")
        for event in airlock.runs.stream(run.id):
            print(event.event, event.data)
        print(airlock.runs.result(run.id))
"""

from ._client import AirlockError, Client, StreamEvent

__all__ = ("AirlockError", "Client", "StreamEvent")
