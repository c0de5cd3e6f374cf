"""radiance-launch: spawn one rank per card, pin, supervise, tear down."""
