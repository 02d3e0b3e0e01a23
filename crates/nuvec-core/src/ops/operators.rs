//! `+ - * / % & | ^ << >>`, unary `-` and `!` on arrays and Rust scalars.

use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Rem, Shl, Shr, Sub};

use crate::array::{Array, ScalarOrArray};
use crate::dtype::{Complex64, DType, bf16, f16};
use crate::primitive::BinaryOp;

use super::elementwise::binary;

macro_rules! binary_operator {
    ($($trait:ident, $method:ident => $op:ident;)*) => {$(
        impl<R: Into<ScalarOrArray>> $trait<R> for Array {
            type Output = Array;
            #[track_caller]
            fn $method(self, rhs: R) -> Array { binary(BinaryOp::$op, self, rhs) }
        }
        impl<R: Into<ScalarOrArray>> $trait<R> for &Array {
            type Output = Array;
            #[track_caller]
            fn $method(self, rhs: R) -> Array { binary(BinaryOp::$op, self, rhs) }
        }
        scalar_left!($trait, $method, $op; bool, u8, u16, u32, u64, i8, i16, i32, i64, usize, f16, bf16, f32, f64, Complex64);
    )*};
}

macro_rules! scalar_left {
    ($trait:ident, $method:ident, $op:ident; $($t:ty),*) => {$(
        impl $trait<Array> for $t {
            type Output = Array;
            #[track_caller]
            fn $method(self, rhs: Array) -> Array { binary(BinaryOp::$op, self, rhs) }
        }
        impl $trait<&Array> for $t {
            type Output = Array;
            #[track_caller]
            fn $method(self, rhs: &Array) -> Array { binary(BinaryOp::$op, self, rhs) }
        }
    )*};
}

binary_operator! {
    Add, add => Add;
    Sub, sub => Subtract;
    Mul, mul => Multiply;
    Div, div => Divide;
    Rem, rem => Remainder;
    BitAnd, bitand => BitwiseAnd;
    BitOr, bitor => BitwiseOr;
    BitXor, bitxor => BitwiseXor;
    Shl, shl => LeftShift;
    Shr, shr => RightShift;
}

impl Neg for Array {
    type Output = Array;
    #[track_caller]
    fn neg(self) -> Array {
        self.negative()
    }
}
impl Neg for &Array {
    type Output = Array;
    #[track_caller]
    fn neg(self) -> Array {
        self.negative()
    }
}

/// `!` is logical negation of booleans and bitwise complement of integers.
impl Not for &Array {
    type Output = Array;
    #[track_caller]
    fn not(self) -> Array {
        if self.dtype() == DType::Bool { self.logical_not() } else { self.bitwise_invert() }
    }
}
impl Not for Array {
    type Output = Array;
    #[track_caller]
    fn not(self) -> Array {
        !&self
    }
}
