"""Running: a resolved graph run step after step. One executor a domain: the host's (host.py) and a
card's (device.py, with its memory and stream); the rank's weights in the form each row reads, and
the step inputs every step writes."""
