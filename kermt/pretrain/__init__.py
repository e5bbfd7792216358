"""Pretraining (vocab / cMIM / hybrid) that any runner drives: batches, globally normalised losses, the step."""
