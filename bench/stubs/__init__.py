"""Local provider stubs for ``bench.senders``: an HTTP server (HTTP/1.1 and h2c with prior
knowledge) and an SMTP server (aiosmtpd), each in a process of its own, answering after a set
latency and counting what they were sent (:mod:`bench.stubs.tally`)."""
