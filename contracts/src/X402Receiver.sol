// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @dev The parts of an EIP-3009 token (USDC FiatToken >= v2.2, TestUSDC) that the receiver uses.
interface IEIP3009Token {
    function transfer(address to, uint256 value) external returns (bool);

    function transferWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes calldata signature
    ) external;

    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes calldata signature
    ) external;
}

/// @title X402Receiver
/// @notice The `payTo` of mindxtrain's paid calls: receives EIP-3009 payments, keeps one record per
///         payment id, and lets only the beneficiary take the money out.
/// @dev Roles, both immutable (no owner, no setters, no proxy):
///      - `beneficiary`: the only account that may `withdraw`. Also allowed everything `settler` is.
///      - `settler`: the node's (hot) key; the only other account that may settle or record.
///      Why recording is restricted: an open `recordPayment` would let anyone write false or spam
///      records, and an open settle would let anyone who sees a payer's signature in the mempool
///      front-run the node with a different payment id (the node's own transaction would then fail
///      and the payment would sit under a stranger's id).
///
///      Three ways to create a record; ids share one namespace and are write-once:
///      - `settleAndRecord`: pulls the money with `receiveWithAuthorization` (payer signed
///        ReceiveWithAuthorization with to = this contract) and records it in the same transaction.
///        Only this contract can submit that authorization, so it cannot be front-run at all.
///      - `settleTransferAndRecord`: the same with `transferWithAuthorization`, i.e. the standard x402
///        "exact" payload (payer signed TransferWithAuthorization with to = this contract). Anyone
///        holding the signature may submit it to the token directly first; the money still arrives
///        here, this call then reverts ("authorization is used or canceled") and the settler can
///        attest the payment with `recordPayment` after checking the token's Transfer event.
///      - `recordPayment`: an attestation by the settler of a payment settled elsewhere (e.g. by an
///        x402 facilitator). The contract cannot check it; it is as trustworthy as the settler key.
///      A record from a settle function always means the token moved `amount` from `payer` to this
///      contract in the same transaction.
///
///      Storage: one slot per payment, `payer` (160 bits) | `amount` (96 bits, up to 7.9e28 base
///      units: 7.9e22 USDC). Larger amounts revert with `AmountTooLarge`.
contract X402Receiver {
    /// @notice The payment token (USDC or TestUSDC).
    IEIP3009Token public immutable token;
    /// @notice Receives withdrawals; the only account that can withdraw.
    address public immutable beneficiary;
    /// @notice May settle and record payments (as may the beneficiary).
    address public immutable settler;

    event PaymentRecorded(bytes32 indexed paymentId, address indexed payer, uint256 amount);
    event Withdrawn(address indexed to, uint256 amount);

    error PaymentAlreadyRecorded(bytes32 paymentId);
    error ZeroPaymentId();
    error ZeroAddress();
    error AmountTooLarge(uint256 amount);
    error NotSettler(address caller);
    error NotBeneficiary(address caller);
    error TokenHasNoCode(address token);
    error TransferFailed();

    uint256 private constant _AMOUNT_SHIFT = 160;

    mapping(bytes32 paymentId => uint256 packedPayment) private _payments;

    constructor(IEIP3009Token token_, address beneficiary_, address settler_) {
        if (address(token_) == address(0) || beneficiary_ == address(0) || settler_ == address(0)) {
            revert ZeroAddress();
        }
        if (address(token_).code.length == 0) revert TokenHasNoCode(address(token_));
        token = token_;
        beneficiary = beneficiary_;
        settler = settler_;
    }

    modifier onlySettler() {
        if (msg.sender != settler && msg.sender != beneficiary) revert NotSettler(msg.sender);
        _;
    }

    /// @notice Record a payment settled elsewhere (an attestation by the settler).
    function recordPayment(bytes32 paymentId, address payer, uint256 amount) external onlySettler {
        _record(paymentId, payer, amount);
    }

    /// @notice Pull a ReceiveWithAuthorization payment (to = this contract) and record it atomically.
    function settleAndRecord(
        bytes32 paymentId,
        address from,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes calldata signature
    ) external onlySettler {
        _record(paymentId, from, value);
        token.receiveWithAuthorization(from, address(this), value, validAfter, validBefore, nonce, signature);
    }

    /// @notice Submit a standard x402 TransferWithAuthorization payment (to = this contract) and
    ///         record it atomically.
    function settleTransferAndRecord(
        bytes32 paymentId,
        address from,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes calldata signature
    ) external onlySettler {
        _record(paymentId, from, value);
        token.transferWithAuthorization(from, address(this), value, validAfter, validBefore, nonce, signature);
    }

    /// @notice The record of `paymentId`; (address(0), 0) when none.
    function payments(bytes32 paymentId) external view returns (address payer, uint256 amount) {
        uint256 word = _payments[paymentId];
        // casting to 'uint160' is safe because the low 160 bits hold the payer (see the layout above)
        // forge-lint: disable-next-line(unsafe-typecast)
        payer = address(uint160(word));
        amount = word >> _AMOUNT_SHIFT;
    }

    /// @notice Send `amount` tokens held here to `to`. Only the beneficiary.
    function withdraw(address to, uint256 amount) external {
        if (msg.sender != beneficiary) revert NotBeneficiary(msg.sender);
        if (to == address(0)) revert ZeroAddress();
        // Safe transfer: accept tokens that return true or nothing; reject false and reverts.
        (bool ok, bytes memory ret) =
            address(token).call(abi.encodeCall(IEIP3009Token.transfer, (to, amount)));
        if (!ok || (ret.length != 0 && (ret.length < 32 || abi.decode(ret, (uint256)) != 1))) {
            revert TransferFailed();
        }
        emit Withdrawn(to, amount);
    }

    /// @dev Effects before the token call (checks-effects-interactions): a re-entrant settle with
    ///      the same id fails on the write-once check.
    function _record(bytes32 paymentId, address payer, uint256 amount) private {
        if (paymentId == bytes32(0)) revert ZeroPaymentId();
        if (payer == address(0)) revert ZeroAddress();
        if (amount > type(uint96).max) revert AmountTooLarge(amount);
        if (_payments[paymentId] != 0) revert PaymentAlreadyRecorded(paymentId);
        _payments[paymentId] = uint256(uint160(payer)) | (amount << _AMOUNT_SHIFT);
        emit PaymentRecorded(paymentId, payer, amount);
    }
}
