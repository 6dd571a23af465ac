"""What a `--net proxy` session talked to, and its held requests (issue 17; its owner fills
this in: egress_report, release_held, drop_held)."""
