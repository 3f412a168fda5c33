"""The HTTP front door of the pipeline (``dedupctl api run``): producers send notifications,
support reads what became of them, profiles are kept up to date, providers post delivery
receipts, marketing runs campaigns. It writes requests to Kafka and reads what the job and the
senders recorded; it never calls a provider.

Pure modules (no I/O): ``accept`` (a notification request checked against the catalog, the
caller and the profile), ``signing`` (receipts' HMAC), ``view`` (a notification's status from
its records), ``fingerprint``. I/O: ``store`` and ``tokens`` (the API's tables), ``producer``
(Kafka), ``outcomes`` (the job's verdicts into the store), ``campaigns``, ``app`` (the routes),
``server`` (uvicorn).
"""
