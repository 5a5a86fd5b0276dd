"""Pure cost logic: no broker, no Redis. Money is integer micro-dollars (µUSD) throughout."""
