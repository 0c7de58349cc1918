"""What a person or a CI job reads: summaries, junit.xml, report.html, the terminal."""
