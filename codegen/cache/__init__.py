"""Kept between calls and processes: the memo, the disk cache, build-once, kernel records."""
