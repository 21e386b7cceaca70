#include "textflag.h"

// func Line(addr uintptr)
TEXT ·Line(SB), NOSPLIT|NOFRAME, $0-8
	MOVD	addr+0(FP), R0
	PRFM	(R0), PLDL1KEEP
	RET
