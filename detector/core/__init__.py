"""The pure core: rows in, findings and planned actions out. No I/O; `now` is passed in."""
