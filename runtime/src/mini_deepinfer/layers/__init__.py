"""Runtime layers that are not part of one model: sampling."""
