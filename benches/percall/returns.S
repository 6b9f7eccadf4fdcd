/* Three ways to reach an empty function and come back, for returns.c:
 * a plain call; the in-process engine's (the return address replaced,
 * the return sent on with a jump); a balanced one (the entry drops the
 * return slot and calls the function, the exit pushes the return address
 * and returns). With -DCLOCK each reads the TSC at its entry and exit. */
    .intel_syntax noprefix
    .text
    .globl plain, replaced, balanced

#ifdef CLOCK
#define READ_CLOCK rdtsc
#else
#define READ_CLOCK
#endif

body:
    ret

plain:
    READ_CLOCK
    call body
    READ_CLOCK
    ret

replaced:
    READ_CLOCK
    mov rax, [rsp]
    mov [rip + saved], rax
    lea rax, [rip + replaced_exit]
    mov [rsp], rax
    jmp body
replaced_exit:
    READ_CLOCK
    sub rsp, 8
    mov rax, [rip + saved]
    mov [rsp], rax
    lea rsp, [rsp + 8]
    jmp [rsp - 8]

balanced:
    READ_CLOCK
    mov rax, [rsp]
    mov [rip + saved], rax
    lea rsp, [rsp + 8]
    lea r11, [rip + body]
    call r11
    READ_CLOCK
    sub rsp, 8
    mov rax, [rip + saved]
    mov [rsp], rax
    ret

    .data
saved:
    .quad 0
    .section .note.GNU-stack, "", @progbits
