"""The decode side: the model runner, the device decode loop with its owner-tagged parked queue, captured
decode graphs with replay verification, host copies and the leak-prevention event log."""
