"""The providers' signed delivery receipts of ``POST /webhooks/{provider}``: one scheme per provider
kind (``notify``, ``twilio``, ``sendgrid``; ``registry``), each verifying its signature and reading
its body into events (pure), and ``apply`` putting the events into the store."""
