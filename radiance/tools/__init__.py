"""Command-line tools: radiance, radiance-launch, rad-info, rad-schemas."""
