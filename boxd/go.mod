module sandbox-bridge.io/boxd

go 1.25.0
