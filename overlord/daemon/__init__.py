"""`overlord daemon`: the policy-brokered resident broker on a unix socket (issue 12)."""
