"""dedupctl: run, feed and inspect the notification dedup pipeline."""
