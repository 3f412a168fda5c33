"""Local servers that speak the providers' protocols, written from their public documentation
and independently of the adapters in ``senders/providers``: FCM HTTP v1 with its OAuth2 token
endpoint and APNs (HTTP/2, ``fcm``, ``apns``, on ``h2``), Twilio's Messages API and SendGrid's v3
mail send (HTTP/1.1, ``twilio``, ``sendgrid``, on ``http1``), a throwaway CA for their TLS
(``tls``). Each answers from a ``Script`` per recipient. The tests run the adapters against them
and ``dedupctl demo`` sends through them (``harness/senders_demo.py``); they are never a
provider of a real deployment."""
