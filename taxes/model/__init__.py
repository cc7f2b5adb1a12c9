"""The analytical model: hardware profiles, the floor, predictions, calibration and validation against measurement."""
