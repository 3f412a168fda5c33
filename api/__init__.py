"""The HTTP front door of the pipeline (``dedupctl api run``): producers send notifications,
support reads what became of them, profiles are kept up to date, providers post delivery
receipts, marketing runs campaigns. It writes requests to Kafka and reads what the job and the
senders recorded; it never calls a provider.

Pure modules (no I/O): ``scopes`` (the scopes and the one route -> scope table), ``callers``
(who calls, and its key space), ``accept`` (a notification request checked against the catalog,
the caller and the profile), ``signing`` (receipts' HMAC), ``view`` (a notification's status
from its records). I/O: ``tokens`` (callers and tokens in the store), ``tables`` and
``migrate`` (the API's tables), ``store`` (idempotency keys, requests, verdicts, receipts),
``erase`` (everything of a user), ``producer`` (Kafka), ``outcomes`` (the job's verdicts into
the store), ``campaigns``; ``gate`` (token, scope, rate, body) and the routes
(``notifications``, ``status_routes``, ``users``, ``webhooks``, ``campaign_routes``), ``app``,
``server`` (uvicorn).
"""
