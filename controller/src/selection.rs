//! Host selection: which free, live, fitting ByoHost a ByoMachine gets (pure logic).
