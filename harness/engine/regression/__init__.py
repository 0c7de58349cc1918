"""What was found before, checked again: saved repros, known findings, replay, minimize, bisect, the kill matrix."""
