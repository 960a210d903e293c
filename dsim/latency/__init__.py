"""Step-time models behind one interface, ``StepTimeModel.step_time(BatchShape) -> seconds``
(roofline, blackbox, unified5, physics, LUT, VIDUR-style, calibrated TPS), the queueing (alpha)
side, the engine host overheads they share, and which model to believe (credibility).  Models
are pure functions of a batch description; registry builds the one a scenario names."""
