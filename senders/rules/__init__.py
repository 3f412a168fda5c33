"""The send-time rules of the issue's table, as pure functions of their inputs and the clock:
quiet hours (``quiet_hours``), the limits (``limits``), and the decision for one message
(``decision``). Nothing here reads a store or the wall clock."""
