"""What every C-like dialect shares: the base emitter, the loop order, staging of
sub-expressions at their loop level, and the sympy printer.
"""
